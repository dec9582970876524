"""Authorization on every door: statement rules, pools, streams, the property test."""
