"""Workflows: reshard, MoveTables, lookup backfill, catch-up, kills and busy writers."""
