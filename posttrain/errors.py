"""User-facing errors: raised for bad input (a flag, a config field, a data file), never for bugs.

The CLI turns a ``UserError`` into one line on stderr and exit status 2, without a traceback.
Messages name what is wrong and where: the file and line, the field and its allowed values.
"""


class UserError(Exception):
    """A mistake the user can fix: bad flag, bad config value, missing or malformed file."""


class DataError(UserError):
    """A data file is missing, empty or malformed (the message names file and line)."""


class ConfigError(UserError):
    """A config field has an invalid value (the message names the field)."""


class NonFiniteError(UserError):
    """A model or its output holds NaN/Inf (a diverged training run): refused with one line naming the step."""
