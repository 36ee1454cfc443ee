! false && echo negated
! true; echo "status $?"
