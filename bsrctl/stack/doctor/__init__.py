"""``bsrctl doctor``: the facts of this machine (``facts``), pure checks over them
(``checks``) and the command (``command``)."""
