"""Units, settings, the suite, typed records and statistics: pure Python, no torch, imported by every layer above."""
