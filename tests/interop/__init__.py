"""Interop tests against real MemPalace 3.11 hubs (marker: interop)."""
