"""samebits.server."""
