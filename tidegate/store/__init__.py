"""The KV store behind Tidegate: etcd through aetcd, wrapped (see api.py for the contract)."""
