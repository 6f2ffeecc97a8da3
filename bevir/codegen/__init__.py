"""GPNPU code generation (later issues)."""
