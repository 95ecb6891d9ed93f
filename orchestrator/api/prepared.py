"""Parsed and validated GraphQL operations, kept per query text.

Why: an agent sends the same few operation texts over and over (``recall`` with a new
question in ``variables``), and graphql-core parses the text and runs the ~30 rules of
the specification over it for every request: 12 ms of a recall request's 133 ms on the
shared benchmark machine (cProfile, in-process, no HTTP). Both depend on the text and the
schema only, so they are kept in a bounded LRU map; Engram's own rules (depth and cost,
which read the variables, and the introspection switch) still run on every request.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection
from typing import Any

from graphql.utilities.type_info import TypeInfo
from graphql.validation import ASTValidationRule

from graphql import DocumentNode, GraphQLError, GraphQLSchema, parse, specified_rules, validate

SPECIFIED = frozenset(specified_rules)


class PreparedQueries:
    """LRU of query text -> (document, the specification rules' errors)."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._documents: OrderedDict[str, DocumentNode] = OrderedDict()
        # id(document) -> (the document, its errors): the document is held, so its id is not reused.
        self._errors: dict[int, tuple[DocumentNode, list[GraphQLError]]] = {}
        self._lock = threading.Lock()

    def parse(self, _context: Any, data: dict[str, Any]) -> DocumentNode:
        """ariadne's ``query_parser``: the kept document of this text, parsed on first sight."""
        query = data["query"]
        with self._lock:
            found = self._documents.get(query)
            if found is not None:
                self._documents.move_to_end(query)
                return found
        document = parse(query)  # a GraphQLError for bad syntax, reported as before
        with self._lock:
            self._documents[query] = document
            while len(self._documents) > self.size:
                _, gone = self._documents.popitem(last=False)
                self._errors.pop(id(gone), None)
        return document

    def validate(self, schema: GraphQLSchema, document_ast: DocumentNode,
                 rules: Collection[type[ASTValidationRule]] | None = None,
                 max_errors: int | None = None, type_info: TypeInfo | None = None
                 ) -> list[GraphQLError]:
        """ariadne's ``query_validator``: the specification's rules once per kept document,
        every other rule (Engram's depth and cost limits, introspection) on each request."""
        rules = tuple(rules or specified_rules)
        own = tuple(r for r in rules if r not in SPECIFIED)
        with self._lock:
            entry = self._errors.get(id(document_ast))
        if entry is not None and entry[0] is document_ast:
            errors = list(entry[1])
        else:
            errors = validate(schema, document_ast, rules=[r for r in rules if r in SPECIFIED],
                              max_errors=max_errors)
            with self._lock:
                text = _text_of(document_ast)
                if text is not None and self._documents.get(text) is document_ast:
                    self._errors[id(document_ast)] = (document_ast, list(errors))
        if own and not errors:
            errors = validate(schema, document_ast, rules=own, max_errors=max_errors)
        return errors


def _text_of(document: DocumentNode) -> str | None:
    source = document.loc.source.body if document.loc is not None else None
    return source
