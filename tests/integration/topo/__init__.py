"""The topo store on each backend."""
