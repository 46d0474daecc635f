"""The Kubernetes CEL library functions the platform's admission policies use, for cel-python.

kube-apiserver 1.32 evaluates ValidatingAdmissionPolicies with the CEL base environment plus
Kubernetes' libraries (k8s.io/apiserver pkg/cel/environment/base.go; the quantity library since
compatibility version 1.28). cel-python has the base environment only; this adds the quantity
functions with the semantics of k8s.io/apimachinery pkg/api/resource ``ParseQuantity``:

    <quantity>        ::= <signedNumber><suffix>
    <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
    <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
    <decimalSI>       ::= m | "" | k | M | G | T | P | E        (and n, u below m)
    <decimalExponent> ::= "e" <signedNumber> | "E" <signedNumber>

``quantity(s)`` raises on anything else (the Go library returns an error, which fails the
expression); ``isQuantity``, ``sign``, ``isGreaterThan``, ``isLessThan`` and ``compareTo`` follow
pkg/cel/library/quantity.go.
"""
from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import celpy
from celpy import celtypes

_BINARY = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1), "k": Decimal("1e3"),
            "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18")}
_QUANTITY = re.compile(r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
                       r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]+|[numkMGTPE]?)$")


class Quantity:
    def __init__(self, text: str):
        match = _QUANTITY.match(text)
        if not match:
            raise ValueError(f"quantities must match the regular expression: {text!r}")
        number, suffix = Decimal(match["number"]), match["suffix"]
        if suffix in _BINARY:
            self.value = number * _BINARY[suffix]
        elif suffix[:1] in ("e", "E"):
            self.value = number * (Decimal(10) ** int(suffix[1:]))
        else:
            self.value = number * _DECIMAL[suffix]
        self.text = text

    def __repr__(self) -> str:
        return f"quantity({self.text!r})"


def _quantity(value: Any) -> Any:
    """A Quantity, or (as the Go library's error fails the expression) a CEL error value."""
    if isinstance(value, (Quantity, celpy.CELEvalError)):
        return value
    try:
        return Quantity(str(value))
    except ValueError as error:
        return celpy.CELEvalError(str(error))


def _is_quantity(value: Any) -> celtypes.BoolType:
    try:
        Quantity(str(value))
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _on_quantities(result):
    def apply(*args: Any) -> Any:
        values = [_quantity(a) for a in args]
        errors = [v for v in values if isinstance(v, celpy.CELEvalError)]
        return errors[0] if errors else result(*(v.value for v in values))
    return apply


def _cmp(a: Decimal, b: Decimal) -> int:
    return (a > b) - (a < b)


FUNCTIONS = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "sign": _on_quantities(lambda q: celtypes.IntType(_cmp(q, Decimal(0)))),
    "isGreaterThan": _on_quantities(lambda a, b: celtypes.BoolType(_cmp(a, b) > 0)),
    "isLessThan": _on_quantities(lambda a, b: celtypes.BoolType(_cmp(a, b) < 0)),
    "compareTo": _on_quantities(lambda a, b: celtypes.IntType(_cmp(a, b))),
}


def program(env: "celpy.Environment", expression: str):
    """A runnable program for ``expression`` with the Kubernetes functions above."""
    return env.program(env.compile(expression), functions=FUNCTIONS)


def evaluate(env: "celpy.Environment", expression: str, activation: dict) -> Any:
    """The expression's value, or the CEL error it ended in (the API server's failurePolicy
    decides what an error means; cel-python raises a final error instead of returning it)."""
    try:
        return program(env, expression).evaluate(activation)
    except celpy.CELEvalError as error:
        return error
