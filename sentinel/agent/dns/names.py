"""The names the agent's DNS server answers, and what each one asks for (``docs/dns.md``).

Relative to the zone (``sentinel.`` by default), each form is a few *components*, each a
Sentinel name (a service, a partition, an instance's label) or a shard key:

========================================  =============================================
``orders``                                 the service's eligible instances
``p1.orders``                              those of partition ``p1``
``tenant-a.key.orders``                    those of the partition key ``tenant-a`` maps to
``a.p1.instance.orders``                   one instance (an SRV target): label, partition
``_orders._tcp`` and ``_p1._orders._tcp``  the same, in RFC 2782's form (SRV);
``_tenant-a._key._orders._tcp``            each component's first label starts with ``_``
========================================  =============================================

A component is one label when it is *plain*: 1 to 63 of ``a-z``, ``0-9`` and ``-``, not
starting with :data:`ENCODED` (DNS is case-insensitive: an upper-case letter could not be told
from a lower-case one). Any other (Sentinel names allow ``.``, ``_``, upper case and 128
characters; keys are any text) is *encoded*: ``x--`` followed by the RFC 4648 base32 of its
UTF-8 bytes, lower case and unpadded, cut into labels of :data:`CHUNK` characters, each
``x--``-prefixed; the component ends at its first label shorter than that (an empty ``x--``
label ends one whose base32 fills its last label). ``Orders.V2`` is ``x--j5zgizlsomxfmmq``.
A DNS name holds 255 octets: a component of up to 128 characters always fits alone in the
zone, a long key beside a long service may not (:class:`NameTooLong`).
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

import dns.name

from sentinel.errors import InvalidName, ValidationError
from sentinel.registry.layout import validate_name

# What docs/dns.md shows a user (the server's own names are its module's business).
__all__ = ["NameTooLong", "Question", "name_of", "zone_name"]

#: The prefix of each label of an encoded component.
ENCODED = "x--"
#: Base32 characters in each label of an encoded component but its last.
CHUNK = 59  # with its prefix, and the RFC 2782 form's "_", 63 octets: a label's most
#: The word of the key form, and of the instance form.
KEY, INSTANCE = "key", "instance"
#: The protocol label of the RFC 2782 form.
TCP = "_tcp"
DEFAULT_ZONE = "sentinel."

_PLAIN = re.compile(r"[a-z0-9-]{1,63}\Z")


class NameTooLong(ValidationError):
    """A name whose DNS form would be over 255 octets."""


@dataclass(frozen=True, slots=True)
class Question:
    """What a name asks for: ``service``'s instances, of ``partition`` (None: the whole
    service), or of the partition ``key`` maps to, or the one instance ``label`` of
    ``partition``; ``srv``: asked in RFC 2782's form."""

    service: str
    partition: str | None = None
    key: str | None = None
    label: str | None = None
    srv: bool = False


def zone_name(zone: str) -> dns.name.Name:
    """``--dns-zone``'s value as an absolute DNS name, lower case; :class:`ValidationError`
    for one that is not a name."""
    try:
        name = dns.name.from_text(zone.strip().lower() or ".")
    except dns.exception.DNSException as exc:
        raise ValidationError(f"--dns-zone {zone!r} is not a DNS name: {exc}") from None
    if name == dns.name.root:
        raise ValidationError("--dns-zone must not be the root: the agent answers its zone only")
    return name


def encode(text: str) -> list[str]:
    """The labels of one component (see the module's documentation)."""
    if _PLAIN.match(text) and not text.startswith(ENCODED):
        return [text]
    letters = base64.b32encode(text.encode()).decode().rstrip("=").lower()
    chunks = [letters[i : i + CHUNK] for i in range(0, len(letters), CHUNK)]
    if not chunks or len(chunks[-1]) == CHUNK:
        chunks.append("")
    return [ENCODED + chunk for chunk in chunks]


def _component(labels: list[str], start: int, srv: bool) -> tuple[str, int]:
    """The component starting at ``labels[start]`` and the index after it; ValueError when
    it is not one."""
    first = labels[start]
    if srv:
        if not first.startswith("_"):
            raise ValueError(first)
        first = first[1:]
    if not first.startswith(ENCODED):
        if not _PLAIN.match(first):
            raise ValueError(first)
        return first, start + 1
    letters, index, label = [], start, first
    while True:
        chunk = label[len(ENCODED) :]
        letters.append(chunk)
        index += 1
        if len(chunk) < CHUNK:
            break
        if index == len(labels) or not labels[index].startswith(ENCODED):
            raise ValueError(label)
        label = labels[index]
    joined = "".join(letters).upper()
    try:
        text = base64.b32decode(joined + "=" * (-len(joined) % 8)).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise ValueError(joined) from None
    return text, index


def parse(labels: list[str]) -> Question | None:
    """The question of a name's labels below the zone (lower case, as text), or None when
    it is none of the forms (a name that cannot exist)."""
    srv = bool(labels) and labels[-1] == TCP
    if srv:
        labels = labels[:-1]
    components, index = [], 0
    try:
        while index < len(labels):
            component, index = _component(labels, index, srv)
            components.append(component)
    except ValueError:
        return None
    question = _question(components, srv)
    if question is None:
        return None
    try:
        validate_name("service", question.service)
        if question.partition is not None:
            validate_name("partition", question.partition)
        if question.label is not None:
            validate_name("instance label", question.label)
    except InvalidName:
        return None
    return question


def _question(components: list[str], srv: bool) -> Question | None:
    if len(components) == 1:
        return Question(components[0], srv=srv)
    if len(components) == 2:
        return Question(components[1], partition=components[0], srv=srv)
    if len(components) == 3 and components[1] == KEY:
        return Question(components[2], key=components[0], srv=srv)
    if len(components) == 4 and components[2] == INSTANCE:
        return Question(components[3], partition=components[1], label=components[0], srv=srv)
    return None


def name_of(question: Question, zone: dns.name.Name) -> dns.name.Name:
    """The DNS name of ``question`` in ``zone``: its RFC 2782 form when ``question.srv``.
    :class:`NameTooLong` when it would not fit in 255 octets."""
    if question.label is not None:
        parts = [question.label, question.partition or "", INSTANCE, question.service]
    elif question.key is not None:
        parts = [question.key, KEY, question.service]
    elif question.partition is not None:
        parts = [question.partition, question.service]
    else:
        parts = [question.service]
    labels: list[str] = []
    for part in parts:
        encoded = encode(part)
        if question.srv:
            encoded[0] = "_" + encoded[0]
        labels += encoded
    if question.srv:
        labels.append(TCP)
    try:
        return dns.name.Name([label.encode() for label in labels]).concatenate(zone)
    except dns.name.NameTooLong:
        raise NameTooLong(
            f"the DNS name of {'/'.join(parts)!r} would be over 255 octets in {zone}"
        ) from None


def instance_name(service: str, partition: str, label: str, zone: dns.name.Name) -> dns.name.Name:
    """The target an SRV record names for one instance: ``LABEL.PARTITION.instance.SERVICE``
    in ``zone``, unique per instance (two on one address, on different ports, are two)."""
    return name_of(Question(service, partition=partition, label=label), zone)
