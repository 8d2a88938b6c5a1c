"""The job store (SQLite by default, PostgreSQL by URL): server/store/store.py has the operations,
schema.py the tables, codec.py how results are kept, writer.py the single writer, location.py
where the store is."""

from harness_env.server.store.location import DATA_DIR_VAR, STORE_URL_VAR, DataDirLock, data_dir_problem, default_data_dir, store_password, store_url
from harness_env.server.store.store import DuplicateKey, Orphan, Store, StoreError
from harness_env.server.store.writer import StoreWriter

__all__ = [
    "DATA_DIR_VAR",
    "STORE_URL_VAR",
    "DataDirLock",
    "DuplicateKey",
    "Orphan",
    "Store",
    "StoreError",
    "StoreWriter",
    "data_dir_problem",
    "default_data_dir",
    "store_password",
    "store_url",
]
