"""Client-side libraries: the DB-API 2.0 driver (:mod:`shardgate.client.dbapi`)
and the synchronous-over-asyncio helpers it is built on."""
