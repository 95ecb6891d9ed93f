"""Validation rules that refuse a GraphQL request before anything runs: literal text and cost.

* ``LiteralInputs``: a string written into the query (``"a\\u0000b"``) or a float
  literal that overflows (``1e999``) is refused by the rules of
  ``orchestrator.inputs``, as variables are when the body is read.
* ``cost_rule``: every field has a cost (``complexity``) and may name arguments that
  multiply it and everything selected under it (page sizes, lineage depth, the
  items of a list argument). An operation whose total is over the limit is refused.
  The arguments are read exactly as execution will read them: variables coerced
  against their declared types **with their defaults applied** (``query($f: Int =
  100)`` costs what ``first: 100`` costs), literals as written. An operation whose
  variables do not coerce is left to execution, which refuses it with the coercion
  error and runs nothing, so the rule never reports a second, internal error.

The cost is linear in the multiplier above a selection, so a fragment is priced once
at multiplier 1 and scaled wherever it is spread: a document that spreads one
fragment a thousand times is priced in one walk of the fragment.
"""

from __future__ import annotations

import math
from typing import Any

from graphql.execution import get_argument_values, get_variable_values

from graphql import (
    FieldNode,
    FloatValueNode,
    FragmentSpreadNode,
    GraphQLError,
    GraphQLInterfaceType,
    GraphQLObjectType,
    InlineFragmentNode,
    OperationDefinitionNode,
    OperationType,
    SelectionSetNode,
    StringValueNode,
    ValidationContext,
    ValidationRule,
    get_named_type,
)
from orchestrator.inputs import text_problem


class LiteralInputs(ValidationRule):
    """Refuses string literals that cannot be stored and float literals that are not finite."""

    def enter_string_value(self, node: StringValueNode, *_: Any) -> None:
        problem = text_problem(node.value)
        if problem:
            self.report_error(GraphQLError(f"a string in the query {problem}", node))

    def enter_float_value(self, node: FloatValueNode, *_: Any) -> None:
        try:
            finite = math.isfinite(float(node.value))
        except ValueError:
            finite = False
        if not finite:
            self.report_error(GraphQLError(f"the number {node.value} is not a finite float", node))


def cost_message(maximum: int, cost: int) -> str:
    return f"The query exceeds the maximum cost of {maximum}. Actual cost is {cost}"


def cost_rule(costs: dict[str, dict[str, dict[str, Any]]], max_cost: int,
              variables: dict[str, Any] | None) -> type[ValidationRule]:
    """The cost limit for one request; ``costs`` maps type -> field -> complexity and
    multipliers (``orchestrator.api.schema.cost_map``); ``variables`` are the request's."""

    class CostLimit(ValidationRule):
        def __init__(self, context: ValidationContext) -> None:
            super().__init__(context)
            self.fragment_costs: dict[str, int] = {}
            self.pricing: set[str] = set()

        def enter_operation_definition(self, node: OperationDefinitionNode, *_: Any) -> None:
            schema = self.context.schema
            coerced = get_variable_values(schema, node.variable_definitions or (), variables or {})
            if isinstance(coerced, list):
                return  # execution refuses the variables (with their own errors) and runs nothing
            root = {OperationType.QUERY: schema.query_type,
                    OperationType.MUTATION: schema.mutation_type,
                    OperationType.SUBSCRIPTION: schema.subscription_type}[node.operation]
            self.fragment_costs.clear()
            try:
                cost = self.price(node.selection_set, root, coerced)
            except RecursionError:
                self.report_error(GraphQLError("the query is nested too deeply to price", node))
                return
            if cost > max_cost:
                self.report_error(GraphQLError(
                    cost_message(max_cost, cost), node,
                    extensions={"cost": {"requestedQueryCost": cost, "maximumAvailable": max_cost}}))

        def price(self, selections: SelectionSetNode | None, parent: Any, variables: Any) -> int:
            """The cost of ``selections`` on ``parent`` under a multiplier of 1."""
            if selections is None or parent is None:
                return 0
            total = 0
            for sel in selections.selections:
                if isinstance(sel, FieldNode):
                    total += self.field(sel, parent, variables)
                elif isinstance(sel, InlineFragmentNode):
                    cond = sel.type_condition
                    total += self.price(sel.selection_set, self.context.schema.get_type(
                        cond.name.value) if cond else parent, variables)
                elif isinstance(sel, FragmentSpreadNode):
                    total += self.fragment(sel.name.value, variables)
            return total

        def fragment(self, name: str, variables: Any) -> int:
            if name in self.fragment_costs:
                return self.fragment_costs[name]
            fragment = self.context.get_fragment(name)
            if fragment is None or name in self.pricing:
                return 0  # unknown or cyclic: other rules report it
            self.pricing.add(name)
            try:
                cost = self.price(fragment.selection_set,
                                  self.context.schema.get_type(fragment.type_condition.name.value),
                                  variables)
            finally:
                self.pricing.discard(name)
            self.fragment_costs[name] = cost
            return cost

        def field(self, node: FieldNode, parent: Any, variables: Any) -> int:
            if not isinstance(parent, (GraphQLObjectType, GraphQLInterfaceType)):
                return 0
            definition = parent.fields.get(node.name.value)
            if definition is None:
                return 0  # introspection or an unknown field (FieldsOnCorrectType reports it)
            spec = costs.get(parent.name, {}).get(node.name.value, {"complexity": 1})
            multiplier = 1
            names = spec.get("multipliers") or []
            if names:
                try:
                    args = get_argument_values(definition, node, variables)
                except Exception:  # a bad literal: other rules report it
                    args = {}
                multiplier = sum(_positive(args.get(n)) for n in names) or 1
            inner = self.price(node.selection_set, get_named_type(definition.type), variables)
            return multiplier * (int(spec.get("complexity", 1)) + inner)

    return CostLimit


def _positive(value: Any) -> int:
    """What an argument adds to its field's multiplier: a list its length, a positive int itself."""
    if isinstance(value, (list, tuple)):
        return len(value)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return 0
