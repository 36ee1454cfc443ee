readonly R=1
( R=2 ) 2>/dev/null
echo "status $? R=$R"
