"""Built-in mechanism plugins, registered through the ``accountant`` entry-point group."""
