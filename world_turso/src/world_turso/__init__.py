"""Work in progress: see the issue tracker."""
