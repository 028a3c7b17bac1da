"""A parameter server's side: a shard's loop over its buckets' messages (server.py) and each
bucket's weights, policy, server update and codecs (bucket.py)."""
