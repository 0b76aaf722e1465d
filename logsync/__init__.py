"""logsync: multi-master replication for MemPalace logstream coordination logs."""

__version__ = "0.1.0"
