echo one \
  two \
  three
