"""The real apiserver's metadata validation, reduced to what a Node's labels and annotations need.

Messages and field paths follow k8s.io/apimachinery (`IsQualifiedName`, `IsValidLabelValue`,
`ValidateAnnotationsSize`) as of Kubernetes 1.32, so that the agent's error mapping is tested
against the text a real cluster sends back.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

TOTAL_ANNOTATION_SIZE_LIMIT_B = 256 * 1024

_QNAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_QNAME_RE = re.compile(_QNAME_FMT)
_LABEL_VALUE_FMT = f"({_QNAME_FMT})?"
_LABEL_VALUE_RE = re.compile(_LABEL_VALUE_FMT)
_DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_FMT = f"{_DNS1123_LABEL_FMT}(\\.{_DNS1123_LABEL_FMT})*"
_DNS1123_SUBDOMAIN_RE = re.compile(_DNS1123_SUBDOMAIN_FMT)

_QNAME_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character"
)
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character"
)
_DNS1123_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character"
)


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    # apimachinery's RegexError, including its double space before "or".
    text = msg + " (e.g. "
    for i, example in enumerate(examples):
        if i > 0:
            text += " or "
        text += f"'{example}', "
    return text + f"regex used for validation is '{fmt}')"


def _max_len_error(length: int) -> str:
    return f"must be no more than {length} bytes"


@dataclass(frozen=True, slots=True)
class Cause:
    """One entry of a Status's `details.causes`."""

    reason: str
    message: str
    field: str

    def as_json(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message, "field": self.field}

    @property
    def text(self) -> str:
        return f"{self.field}: {self.message}"


def _go_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _invalid(field: str, value: str, detail: str) -> Cause:
    return Cause("FieldValueInvalid", f"Invalid value: {_go_quote(value)}: {detail}", field)


def qualified_name_problems(name: str) -> list[str]:
    """IsQualifiedName: an optional DNS-1123 subdomain prefix and '/', then a name of ≤ 63."""
    problems: list[str] = []
    parts = name.split("/")
    if len(parts) == 1:
        short = parts[0]
    elif len(parts) == 2:
        prefix, short = parts
        if not prefix:
            problems.append("prefix part must be non-empty")
        else:
            if len(prefix) > 253:
                problems.append("prefix part " + _max_len_error(253))
            if not _DNS1123_SUBDOMAIN_RE.fullmatch(prefix):
                problems.append(
                    "prefix part "
                    + _regex_error(_DNS1123_SUBDOMAIN_MSG, _DNS1123_SUBDOMAIN_FMT, "example.com")
                )
    else:
        return [
            "a qualified name "
            + _regex_error(_QNAME_MSG, _QNAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not short:
        problems.append("name part must be non-empty")
    elif len(short) > 63:
        problems.append("name part " + _max_len_error(63))
    if short and not _QNAME_RE.fullmatch(short):
        problems.append(
            "name part "
            + _regex_error(
                "must consist of alphanumeric characters, '-', '_' or '.', and must start and "
                "end with an alphanumeric character",
                _QNAME_FMT,
                "MyName",
                "my.name",
                "123-abc",
            )
        )
    return problems


def label_value_problems(value: str) -> list[str]:
    problems: list[str] = []
    if len(value) > 63:
        problems.append(_max_len_error(63))
    if not _LABEL_VALUE_RE.fullmatch(value):
        problems.append(
            _regex_error(_LABEL_VALUE_MSG, _LABEL_VALUE_FMT, "MyValue", "my_value", "12345")
        )
    return problems


def validate_metadata(labels: Mapping[str, str], annotations: Mapping[str, str]) -> list[Cause]:
    """Every problem the apiserver would report for these labels and annotations."""
    causes: list[Cause] = []
    for key, value in sorted(labels.items()):
        causes.extend(_invalid("metadata.labels", key, p) for p in qualified_name_problems(key))
        causes.extend(_invalid("metadata.labels", value, p) for p in label_value_problems(value))
    for key in sorted(annotations):
        causes.extend(
            _invalid("metadata.annotations", key, p) for p in qualified_name_problems(key.lower())
        )
    total = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
    if total > TOTAL_ANNOTATION_SIZE_LIMIT_B:
        causes.append(
            Cause(
                "FieldValueTooLong",
                f"Too long: may not be more than {TOTAL_ANNOTATION_SIZE_LIMIT_B} bytes",
                "metadata.annotations",
            )
        )
    return causes
