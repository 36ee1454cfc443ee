s="Hello World"
echo "${s^^}" "${s,,}" "${s^}"
