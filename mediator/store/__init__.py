"""Persistence: the schema, the named queries and the one module that imports psycopg (db.py)."""
