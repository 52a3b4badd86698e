"""Reports rendered from evidence.json, never from live state."""
