"""The BEVFormer example end to end (examples/bevformer: the model, the e2e flow, frame
sequences, the views, the notebook)."""
