touch .hidden visible
echo *
