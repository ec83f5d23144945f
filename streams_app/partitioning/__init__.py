"""Partitioned streams: the partitions of a logical stream and the route of a key (partitions), the
live layout recorded in Redis (layout), and draining a previous epoch's partitions (drain).
"""
