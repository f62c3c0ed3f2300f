"""Peer discovery: each mechanism reports the full peer list whenever it changes.

Mechanisms live one per module (``static``, ``etcd``, ``dns``, ``kubernetes``) and are
imported lazily by :func:`smockron.cluster.discovery.base.build`, so a node using a
static list never imports an etcd or Kubernetes client.
"""
