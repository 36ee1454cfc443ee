false | true; echo "status $?"
true | false; echo "status $?"
