"""caffe.Datum built with protobuf's own runtime: the independent decoder the LMDB and
protowire tests hold packer's wire codec to."""
from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = ["Datum", "caffe_datum_class"]


def caffe_datum_class():
    """Build caffe.Datum from caffe.proto's field numbers with protobuf's descriptor API."""
    fdp = descriptor_pb2.FileDescriptorProto(name="caffe_datum_test.proto", package="caffe_t",
                                             syntax="proto2")
    msg = fdp.message_type.add(name="Datum")
    F = descriptor_pb2.FieldDescriptorProto
    for name, number, ftype, label in [
        ("channels", 1, F.TYPE_INT32, F.LABEL_OPTIONAL),
        ("height", 2, F.TYPE_INT32, F.LABEL_OPTIONAL),
        ("width", 3, F.TYPE_INT32, F.LABEL_OPTIONAL),
        ("data", 4, F.TYPE_BYTES, F.LABEL_OPTIONAL),
        ("label", 5, F.TYPE_INT32, F.LABEL_OPTIONAL),
        ("float_data", 6, F.TYPE_FLOAT, F.LABEL_REPEATED),
        ("encoded", 7, F.TYPE_BOOL, F.LABEL_OPTIONAL),
    ]:
        msg.field.add(name=name, number=number, type=ftype, label=label)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("caffe_t.Datum"))


Datum = caffe_datum_class()
