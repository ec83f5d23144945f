"""The operator's long-running work on live streams: the reclaim daemon's passes (reclaim) and an
online change of a stream's partition count (repartition).
"""
