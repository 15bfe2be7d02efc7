"""samebits.engine."""
