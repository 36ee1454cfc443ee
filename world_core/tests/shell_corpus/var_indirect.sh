name=target
target=found
echo "${!name}"
