nosuchcommand_xyz 2>/dev/null
echo "status $?"
