"""One module per CLI command: parse nothing, validate options, make one conversion or inspection call."""
