"""BEVFormer-tiny as PyTorch modules with the official state_dict key names."""
