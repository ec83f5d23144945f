"""Writing messages: publish() and publish_many() (producer), deferred delivery (scheduled), the
payload envelope (codec) and the Message a consumer is handed (message).
"""
