"""The package as a whole and its top-level modules: the CLI, optional extras, the import
layering, the docs' examples, security, crash safety, determinism, fuzzing."""
