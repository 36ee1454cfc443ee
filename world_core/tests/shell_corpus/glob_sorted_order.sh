touch b a c B A
echo *
