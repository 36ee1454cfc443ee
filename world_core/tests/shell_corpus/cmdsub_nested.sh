echo "$(echo "outer $(echo inner)")"
