"""samebits.models."""
