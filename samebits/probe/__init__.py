"""samebits probe: reproduce batch variance in ops and a tiny Llama, per implementation (docs/PROBES.md)."""
