"""Our event.proto and summary.proto against the tensorboard package's own descriptors.

    tensorboard_proto_test.py DESCRIPTOR_SET

DESCRIPTOR_SET is what proto_library //integration/metrics:tensorboard_proto writes (a
FileDescriptorSet of event.proto and summary.proto). Every message, field and enum value of ours must
exist upstream (tensorboard.compat.proto.event_pb2 / summary_pb2, the same messages as TensorFlow's)
under the same name with the same number, type, label, message or enum type and oneof, so the bytes
we write are the Event TensorBoard reads.
"""

import sys

from google.protobuf import descriptor_pb2
from tensorboard.compat.proto import event_pb2, summary_pb2

OURS, THEIRS = "orthoshard.tensorboard", "tensorboard"


def upstream_messages():
    """Full name (without package) -> DescriptorProto of every upstream message, nested included."""
    found = {}

    def add(descriptor, prefix):
        proto = descriptor_pb2.DescriptorProto()
        descriptor.CopyToProto(proto)
        found[prefix + descriptor.name] = proto
        for nested in descriptor.nested_types:
            add(nested, prefix + descriptor.name + ".")

    for module in (event_pb2, summary_pb2):
        for descriptor in module.DESCRIPTOR.message_types_by_name.values():
            add(descriptor, "")
    return found


def strip_package(type_name, package):
    prefix = "." + package + "."
    assert type_name == "" or type_name.startswith(prefix), (type_name, package)
    return type_name[len(prefix):] if type_name else ""


def compare_message(name, ours, theirs, problems, checked):
    by_name = {f.name: f for f in theirs.field}
    for field in ours.field:
        where = f"{name}.{field.name}"
        up = by_name.get(field.name)
        if up is None:
            problems.append(f"{where}: upstream has no such field")
            continue
        ours_oneof = ours.oneof_decl[field.oneof_index].name if field.HasField("oneof_index") else None
        up_oneof = theirs.oneof_decl[up.oneof_index].name if up.HasField("oneof_index") else None
        for what, a, b in (("number", field.number, up.number), ("type", field.type, up.type),
                           ("label", field.label, up.label),
                           ("type name", strip_package(field.type_name, OURS),
                            strip_package(up.type_name, THEIRS)),
                           ("oneof", ours_oneof, up_oneof)):
            if a != b:
                problems.append(f"{where}: {what} {a!r}, upstream {b!r}")
        checked.append(f"{where} = {field.number}")
    enums = {e.name: e for e in theirs.enum_type}
    for enum in ours.enum_type:
        up = enums.get(enum.name)
        if up is None:
            problems.append(f"{name}.{enum.name}: upstream has no such enum")
            continue
        up_values = {v.name: v.number for v in up.value}
        for value in enum.value:
            if up_values.get(value.name) != value.number:
                problems.append(f"{name}.{enum.name}.{value.name} = {value.number}, upstream "
                                f"{up_values.get(value.name)!r}")
            checked.append(f"{name}.{enum.name}.{value.name} = {value.number}")


def main():
    files = descriptor_pb2.FileDescriptorSet.FromString(open(sys.argv[1], "rb").read()).file
    upstream = upstream_messages()
    problems, checked, messages = [], [], []

    def walk(message, prefix):
        name = prefix + message.name
        messages.append(name)
        if name not in upstream:
            problems.append(f"{name}: upstream has no such message")
        else:
            compare_message(name, message, upstream[name], problems, checked)
        for nested in message.nested_type:
            walk(nested, name + ".")

    for file in files:
        assert file.package == OURS, file.package
        for message in file.message_type:
            walk(message, "")
    assert sorted(messages) == ["Event", "SessionLog", "Summary", "Summary.Value"], messages
    assert not problems, "\n".join(problems)
    print(f"PASS: {len(checked)} fields and enum values match tensorboard's descriptors: "
          + ", ".join(checked))


main()
