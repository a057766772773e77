"""Codecs: bytes <-> pixels and wire formats (images, videos, resizing, tf.train.Example, protobuf wire, TFRecord framing). No I/O policy, no processes."""
