"""Which functions a statement may call.

Two lists, checked on the names of every function call at any depth of a
statement (table functions in FROM included):

* **Never called**, by anyone, admin included (:func:`never_called`):
  functions that run SQL given as a string (``ts_stat``, ``ts_rewrite``,
  ``query_to_xml``..., ``table_to_xml`` and the other ``*_to_xml`` helpers,
  ``cursor_to_xml``, ``dblink*``, SQLite's ``eval``) — the gate refuses them
  rather than parse the text they take — and functions that change the state
  of the database session in a way the next user of the pooled connection
  would inherit (``set_config``, which is ``SET``; advisory and named locks:
  ``pg_advisory_lock*``, ``pg_try_advisory_*``, MariaDB ``GET_LOCK``,
  ``RELEASE_LOCK``...; ``setseed``; ``LAST_INSERT_ID(x)`` with an argument is
  caught by the rules), and server control (``pg_reload_conf``, replication
  slots, backups, WAL).
* **The allow-list** for callers below admin (:func:`allowed`): the built-in
  ordinary functions of the shard's dialect, generated from each server's own
  catalog (:mod:`shardgate.auth.function_names`,
  ``scripts/gen_function_allowlist.py``) without the names of
  :data:`BELOW_ADMIN_DENIED` (sequences, settings, privileges, catalog
  lookups, sleeps, connection and server facts). Any other name (a user
  function, a schema-qualified call outside ``pg_catalog``, a function of
  another dialect) is refused, naming it.

Which dialect: the shards' of every keyspace the statement reaches (the
session's and each table's); a function must be on the list of each, so a
statement reaching a PostgreSQL and a MariaDB keyspace may call what both
allow. A keyspace whose dialect is not known (no shard yet) allows nothing but
what all three dialects allow.
"""

from __future__ import annotations

from shardgate.auth import function_names

#: Functions nobody may call through the gate, with why (see the module docstring).
NEVER_CALLED: dict[str, str] = {
    **{name: "runs SQL given as a string, outside the gate's rules and ACLs" for name in (
        "ts_stat", "ts_rewrite", "query_to_xml", "query_to_xmlschema",
        "query_to_xml_and_xmlschema", "cursor_to_xml", "cursor_to_xmlschema", "table_to_xml",
        "table_to_xmlschema", "table_to_xml_and_xmlschema", "schema_to_xml",
        "schema_to_xmlschema", "schema_to_xml_and_xmlschema", "database_to_xml",
        "database_to_xmlschema", "database_to_xml_and_xmlschema", "eval", "ts_debug",
        "xmltable_from_query", "execute", "exec", "sp_executesql")},
    **{name: "changes the database session's state, which the next user of the pooled "
              "connection would inherit (SET is refused for the same reason)" for name in (
        "set_config", "setseed", "get_lock", "release_lock", "release_all_locks",
        "is_used_lock", "master_pos_wait", "master_gtid_wait", "source_pos_wait",
        "pg_sleep_for", "pg_sleep_until", "pg_notify")},
    **{name: "controls the database server, not one keyspace" for name in (
        "pg_reload_conf", "pg_rotate_logfile", "pg_promote", "pg_terminate_backend",
        "pg_cancel_backend", "pg_switch_wal", "pg_create_restore_point", "pg_backup_start",
        "pg_backup_stop", "pg_start_backup", "pg_stop_backup", "pg_wal_replay_pause",
        "pg_wal_replay_resume", "pg_log_backend_memory_contexts", "pg_import_system_collations",
        "binlog_gtid_pos")},
}
#: Name prefixes of :data:`NEVER_CALLED` functions.
NEVER_PREFIXES: dict[str, str] = {
    "pg_advisory_": NEVER_CALLED["set_config"],
    "pg_try_advisory_": NEVER_CALLED["set_config"],
    "pg_stat_reset": NEVER_CALLED["pg_reload_conf"],
    "pg_create_": "creates replication slots or restore points on the server",
    "pg_drop_replication": "drops the server's replication slots (change streams use them)",
    "pg_replication_": "changes the server's replication state",
    "pg_logical_": "reads or writes the server's logical replication stream",
    "pg_copy_": "copies the server's replication slots",
    "dblink": "reaches another server with SQL given as a string",
    "binary_upgrade_": "is the server's upgrade machinery",
}

#: Built-in functions a caller below admin may not call even where the dialect's
#: catalog lists them: sequences (``nextval``, ``setval``...), settings, privileges,
#: comments and catalog lookups, sleeps and benchmarks, facts about the connection
#: and the server, large objects, and every ``pg_*`` / ``sqlite_*`` helper.
BELOW_ADMIN_DENIED = frozenset({
    "nextval", "setval", "currval", "lastval", "current_setting", "set_config", "setseed",
    "col_description", "obj_description", "shobj_description", "getpgusername",
    "inet_client_addr", "inet_client_port", "inet_server_addr", "inet_server_port",
    "loread", "lowrite", "currtid2", "row_security_active", "makeaclitem", "mxid_age",
    "amvalidate", "plpgsql_validator", "postgresql_fdw_validator", "xmlvalidate",
    "sleep", "benchmark", "connection_id", "found_rows", "row_count", "last_insert_id",
    "binlog_gtid_pos", "decode_histogram", "procedure", "load_file", "updatexml",
    "uuid_short", "sys_guid", "name_const", "old_value", "values", "value", "default",
    "sqlite_compileoption_get", "sqlite_compileoption_used", "sqlite_offset",
    "load_extension", "fts3_tokenizer", "readfile", "writefile", "edit",
    "version", "user", "system_user", "session_user", "current_user",
    "current_role", "current_query", "changes", "total_changes", "last_insert_rowid",
})
#: Name prefixes of :data:`BELOW_ADMIN_DENIED`.
BELOW_ADMIN_PREFIXES = ("pg_", "lo_", "acl", "has_", "to_reg", "txid", "fmgr_", "sqlite_",
                        "brin_", "gin_", "spg_",
                        "master_", "is_free_lock", "is_used_lock", "get_lock", "release_")


def never_called(name: str) -> str | None:
    """Why nobody may call ``name`` (lower-case), or None."""
    why = NEVER_CALLED.get(name)
    if why is not None:
        return why
    for prefix, why in NEVER_PREFIXES.items():
        if name.startswith(prefix):
            return why
    return None


def below_admin_denied(name: str) -> bool:
    """True when a caller below admin may not call ``name`` whatever the dialect."""
    return (name in BELOW_ADMIN_DENIED or name.startswith(BELOW_ADMIN_PREFIXES)
            or never_called(name) is not None)


#: The allow-list per shard dialect (the tablets' ``dialect``).
ALLOWED: dict[str, frozenset[str]] = {
    "postgres": function_names.POSTGRES,
    "mysql": function_names.MARIADB,
    "sqlite": function_names.SQLITE,
}
#: What every dialect allows (a keyspace whose dialect is not known).
COMMON = function_names.POSTGRES & function_names.MARIADB & function_names.SQLITE


def allowed(name: str, dialect: str | None) -> bool:
    """True when a caller below admin may call built-in ``name`` on a ``dialect`` shard."""
    return name in ALLOWED.get(dialect or "", COMMON)
