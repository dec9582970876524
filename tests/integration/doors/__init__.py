"""The front doors: gRPC, DB-API, the MySQL listener with real clients, the console
API, sysbench."""
