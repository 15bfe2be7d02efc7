"""samebits.diagnostics."""
