"""shardgate: one sharded database over ordinary SQL databases, in the spirit of Vitess."""

__version__ = "0.1.0"
