echo 'make me loud' | tr '[:lower:]' '[:upper:]'
