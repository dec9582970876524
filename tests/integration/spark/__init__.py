"""The Spark pipeline: sources, writer, jobs, lake, production mode (real local Spark)."""
