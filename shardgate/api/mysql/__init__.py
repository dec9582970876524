"""The gate's MySQL-protocol listener: every MySQL client, ORM and BI tool, unchanged.

Built on mysql-mimic. :func:`serve_mysql` starts it over a
:class:`~shardgate.gate.Gate`; ``docs/clients.md`` shows each client and the
error-number mapping.
"""

from shardgate.api.mysql.server import DEFAULT_MYSQL_PORT, MysqlListener, TlsConfig, serve_mysql

__all__ = ["DEFAULT_MYSQL_PORT", "MysqlListener", "TlsConfig", "serve_mysql"]
