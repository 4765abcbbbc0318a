"""Protocol buffer sources and generated modules (see proto/generate.py)."""
