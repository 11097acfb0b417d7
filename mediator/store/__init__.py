"""Persistence: the schema, the named queries, the query methods (tx.py) and the one module that
imports psycopg (connector.py)."""
