"""The validation error type shared by the pure core, the services and the API.

Validation collects every bad field before failing, so a caller sees all of its
mistakes at once; the API turns a ValidationError into a 422 problem+json whose
`errors` list is `[{"field", "message"}]` with dotted JSON paths.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FieldError:
    field: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"field": self.field, "message": self.message}


class ValidationError(ValueError):
    """One or more invalid fields; `errors` lists every one of them."""

    def __init__(self, errors: list[FieldError] | FieldError):
        self.errors = [errors] if isinstance(errors, FieldError) else list(errors)
        super().__init__("; ".join(f"{e.field}: {e.message}" for e in self.errors))

    @classmethod
    def single(cls, field: str, message: str) -> ValidationError:
        return cls([FieldError(field, message)])


class SettingsError(ValueError):
    """A PUNCTUAL_* variable has a bad value; the message names the variable."""
