[[ apple < banana ]] && echo ordered
