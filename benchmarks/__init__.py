"""`ptc bench`: the build measured against its physical floor (see suite.py)."""
