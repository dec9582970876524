"""Queues: table, segmented and inbox stores, managers, gRPC receivers."""
